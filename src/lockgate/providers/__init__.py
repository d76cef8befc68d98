"""Model providers: the Provider protocol, error classification, OpenAI-compatible client."""

from lockgate.providers.base import Completion, CompletionRequest, Provider, ProviderError
from lockgate.providers.openai import OpenAICompatible, classify_response

__all__ = ["Completion", "CompletionRequest", "OpenAICompatible", "Provider",
           "ProviderError", "classify_response"]
