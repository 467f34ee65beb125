"""The Hugging Face Hub: the client's settings and errors, pulling models, pushing them."""
