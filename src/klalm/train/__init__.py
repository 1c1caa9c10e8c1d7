"""klalm.train."""
