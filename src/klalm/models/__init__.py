"""klalm.models."""
