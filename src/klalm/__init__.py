"""klalm: pretraining framework for Kalman Linear Attention language models and their baselines."""

__version__ = "0.1.0"
