"""Serving: ONNX export (export), the HTTP server (server), the REPL (repl)."""
