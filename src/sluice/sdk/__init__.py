"""What runs inside a training job. Imports nothing heavy and nothing of the control plane."""
