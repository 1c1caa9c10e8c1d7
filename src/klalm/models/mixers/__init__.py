"""klalm.models.mixers."""
