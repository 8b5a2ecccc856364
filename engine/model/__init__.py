"""The model: what a checkpoint describes (model_spec), how it is loaded (hf_folder, gguf, tokenizer), the
transformer and its MoE layer, the paged KV cache and the batch a forward pass takes. Nothing here knows of
requests, scheduling or speculation."""
