"""The operator as Kueue's controller for its own kinds."""
