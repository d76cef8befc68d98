"""lockgate: durable, leased LLM prompt tasks on SQL databases, with a release gate."""

__version__ = "0.1.0"
