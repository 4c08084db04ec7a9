"""The built-in demo handler (specs/protocol.md, 'The demo handler') and the `synapse demo`
walkthrough."""

from synapse.demo.handler import DemoHandler

__all__ = ["DemoHandler"]
