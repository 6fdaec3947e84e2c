"""What the Gemini tests share: a model the stand-in answers, one declared function and the
SDK setting that leaves calling it to the test (google-genai, tests/gateway/test_gateway_gemini_*)."""

from __future__ import annotations

from google.genai import types

MODEL = "gemini-2.5-flash"
WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="The weather in a city.",
            parameters_json_schema={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        )
    ]
)
# The SDK would otherwise call Python functions itself; the tests play the client's part.
MANUAL = types.AutomaticFunctionCallingConfig(disable=True)
