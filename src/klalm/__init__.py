"""klalm: pretraining framework for Kalman Linear Attention language models and their baselines.

Importing klalm registers its Hugging Face classes, so `AutoModelForCausalLM.from_pretrained(dir)` loads
an exported klalm checkpoint.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from klalm.models.config import KLALMConfig
from klalm.models.hf import KLALMForCausalLM

__version__ = "0.1.0"

AutoConfig.register(KLALMConfig.model_type, KLALMConfig, exist_ok=True)
AutoModelForCausalLM.register(KLALMConfig, KLALMForCausalLM, exist_ok=True)
