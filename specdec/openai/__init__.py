"""`specdec openai`: an OpenAI-compatible HTTP API in front of the ensemble.

FastAPI on uvicorn; each request is one gRPC stream to the ensemble through tritonclient's
asyncio client (triton.py). Chat templates are applied here with the target's tokenizer
(protocol.py); the ensemble tokenizes the rendered text as it does any prompt. No Triton import,
no torch.
"""
