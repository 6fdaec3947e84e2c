"""The provider-compatible gateway: OpenAI Chat Completions and Responses and Anthropic
Messages, recorded, counted and fitted in the call path (one wire contract: wire.py)."""
