"""klalm.train: what `klalm-train` runs (app.py), its LightningModule (module.py), callbacks, checkpoints.

Entry points other code uses: `klalm.cli.train` (the console script) and `klalm.train.app.run(cfg)` (one run from a
composed config); `klalm.models.checkpoint.load_model(path)` reads back what a run wrote.
"""
