"""What more than one test module uses: tokenizers, request cases,
hypothesis strategies, stand-in engines, the tiny GGUF model, the command
line in process, the gateway's answer shapes, and ``need`` for tools the
test command sets up. Fixtures and hypothesis profiles stay in conftest.py."""
