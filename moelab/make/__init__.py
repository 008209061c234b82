"""make: the scripts that produce ``data/`` — nothing in the library's import path reads them.

* :mod:`moelab.make.train` — ``moelab train-moe``: train a project MoE (corpus, tokenizer, model);
  :mod:`moelab.make.tiny_moe` — ``moelab train-tiny-moe`` (the same with ``--preset tiny-moe``).
* :mod:`moelab.make.tiny_moe_trace` — capture the tiny MoE's bundled trace and write its card.
* :mod:`moelab.make.deployment_trace` — record notebook 06's requests through a live vLLM engine (the capture
  the book shows 06 from where no live engine is installed).
* :mod:`moelab.make.sharegpt_moe` — capture the ShareGPT-MoE's real traces, their locality statistics
  and its model card.
* :mod:`moelab.make.calibrate` — ``moelab calibrate``: measure a GPU's step costs into the tables the
  cost models fit on.

Notebooks and the paper folders import nothing from here.
"""
