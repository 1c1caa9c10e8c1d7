"""klalm.train: what `klalm-train` runs (app.py), its LightningModule (module.py), callbacks, checkpoints.

Entry points other code uses: `klalm.cli.train` (the console script), `klalm.train.app.run(cfg)` (one run from a
composed config), and `klalm.train.checkpoint.load_model(path) -> (model, tokenizer)` (run dir, HF export or .ckpt).
"""
