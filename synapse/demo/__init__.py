"""The built-in demo handler (CONTRACT §8) and the `synapse demo` walkthrough."""

from synapse.demo.handler import DemoHandler

__all__ = ["DemoHandler"]
