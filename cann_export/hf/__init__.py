"""Hugging Face model directories (``save_pretrained`` output or a hub-cache snapshot) as models: the task from
config.json (``tasks``), Optimum's input/output/axis names, dummy inputs from the config (``inputs``), weights
checked before transformers reads them (``weights``), tokenizer/processor files carried into the bundle
(``files``). Offline only: nothing is ever downloaded. Registered by cann_export.plugins.hf."""
