"""Capture: what the framework hooks share, framework by framework and none.

- :mod:`.hookcore`: the hooks' framework-free core (always-on scalars, NVML sampling, the
  window's analysis thread and its child process, the run summary).
- :mod:`.window_child`: the window's analysis in a low-priority child process, with its typed
  job and result.
- :mod:`.torch_env` / :mod:`.keras_env`: what the PyTorch and Keras hooks read from their
  framework (flags, autocast, compile state, memory, CUPTI's teardown).
- :mod:`.torch_window`: the one ``torch.profiler`` window the PyTorch hook and the Keras
  callback's torch backend both run.

The public adapters (``tb_gpuprof.torch``, ``.keras``, ``.lightning``, ``.transformers``)
stay where users import them and stay thin. Nothing here is imported by ``import
tb_gpuprof``; torch and TensorFlow are imported only inside the functions that need them.
"""
