"""Evaluation: zero-shot lm-eval of checkpoints (HellaSwag, PIQA; offline local tasks) and held-out perplexity.

Public entry points:
- `evaluate_checkpoints(checkpoints, tasks, *, output_dir, data_dir=None, limit=None, ...)`: what `klalm-eval` runs.
- `evaluate_model(model, tokenizer, specs, task_manager, *, limit=None, ...)`: one in-memory model
  (`specs, task_manager = resolve_tasks(tasks, data_dir)`).
- `evaluate_loss(model, dataloader, *, max_batches=None, device=None)`: held-out loss / ppl / tokens.
lm-eval itself is imported only when a harness function runs.
"""

from klalm.eval.harness import evaluate_model, resolve_tasks
from klalm.eval.perplexity import evaluate_loss
from klalm.eval.runner import evaluate_checkpoints

__all__ = ["evaluate_checkpoints", "evaluate_loss", "evaluate_model", "resolve_tasks"]
