"""klalm.eval."""
