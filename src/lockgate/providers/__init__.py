"""Model providers: the Provider protocol, error classification, what responses say about
limits (headers), the OpenAI-compatible client."""

from lockgate.providers.base import (
    CallOutcome,
    Completion,
    CompletionRequest,
    Provider,
    ProviderError,
)
from lockgate.providers.openai import OpenAICompatible, classify_response

__all__ = ["CallOutcome", "Completion", "CompletionRequest", "OpenAICompatible", "Provider",
           "ProviderError", "classify_response"]
