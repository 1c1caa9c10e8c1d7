"""klalm.tasks."""
