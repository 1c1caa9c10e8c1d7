"""klalm.data."""
