"""Samplers: hf (embedded), vllm, openai."""
