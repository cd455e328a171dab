"""Recording moe-trace files from Hugging Face models (extra ``tracer``)."""
