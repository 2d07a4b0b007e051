"""What the generation app tells the apps above it, without importing them."""

from django.dispatch import Signal

# A generation finished and its candidates are ranked (argument: generation_id). The review
# app listens: above the queue's threshold it applies the first candidate itself.
generation_ranked = Signal()
