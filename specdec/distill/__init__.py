"""`specdec distill`: train a draft model for speculative decoding from the target itself.

Knowledge distillation (Hinton et al. 2015) of the target's token distributions into a small
draft, on text the target writes itself (DistillSpec, Zhou et al. 2023: on-policy data and the
target's full distribution raise acceptance). The draft starts from a subset of the target's own
layers at its width, sharing its embeddings and LM head, or from a user-supplied smaller config.
Acceptance and the draft/target cost ratio are measured with the project's own engine, and the
speedup is predicted with Leviathan et al. 2023's cost model.

  checks.py   refusals before any work: target, output directory, draft config, memory data.py
  prompts, corpus, and the target's continuations (generated with specdec's loop) draft.py    the
  draft's config and initial weights; saving it as a Hugging Face directory train.py    KL(target ||
  draft) training with periodic checkpoints and resume measure.py  held-out acceptance by position,
  c and the predicted speedup, with specdec.runtime.engine eagle3.py   `--method eagle3`: an EAGLE-3
  head (Li et al. 2025) trained with training-time test eagle3_run.py  its run after the shared
  stages: checkpoints, measurement, speculators output cli.py      the command: options, the run
  from start (or last checkpoint) to report
"""
import os

# OpenMP threads that spin between operators steal the cores the next operator needs when the
# machine is shared: on 2 busy cores a batch-64 target step took 20x longer with two spinning
# threads than with two passive ones. Set before torch starts its thread pool: `specdec distill`
# loads this package before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
