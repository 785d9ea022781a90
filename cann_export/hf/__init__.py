"""Hugging Face model directories (``save_pretrained`` output or a hub-cache snapshot) as models: the task from
config.json (``tasks``), Optimum's input/output/axis names, dummy inputs from the config (``inputs``), weights
checked before transformers reads them (``weights``), tokenizer/processor files carried into the bundle
(``files``). Offline only: nothing is ever downloaded. Registered by cann_export.plugins.hf.

Reusable pieces (the multi-graph components build their graphs from them): ``tasks.TASKS`` / ``tasks.detect``
(the task table: auto class, Optimum's outputs and axes, ``graphs``); ``config.read_config`` (the checked
config.json); ``files.resolve`` / ``files.companions`` (the directory, its roots, the files a bundle carries);
``weights.checked_weights`` (the weight files transformers will load, checked, inside the directory);
``model.load_pretrained`` / ``model.task_module`` (the model and its Optimum-named wrapper);
``inputs.dummy_specs`` / ``inputs.tensors`` / ``inputs.AXES`` (dummy inputs, axis names)."""
