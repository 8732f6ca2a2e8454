"""What the text families share beyond the embeddings package: a sequence-classification model
directory (modeldir.py), the BERT classifier over embeddings' encoder (model.py) and the backend
that scores texts and text pairs (backend.py). The reranker (``adapters/rerank``) and the text
classifier (``adapters/textclass``) are this backend under two wire specs."""
