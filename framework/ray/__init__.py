"""fw inside Ray Train: a Trainer built in a Ray worker's loop reports to Ray and resumes from Ray's checkpoint."""
