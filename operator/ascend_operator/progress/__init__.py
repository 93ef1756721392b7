"""Rank 0's figures, its history and its notices, read into the job's status."""
