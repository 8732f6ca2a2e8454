"""Sentence embeddings: OpenAI-style ``/v1/embeddings`` over a BERT-family encoder."""
