"""The provider-compatible gateway: OpenAI Chat Completions and Anthropic Messages, recorded,
counted and fitted in the call path."""
