"""The `synapse` command line."""
