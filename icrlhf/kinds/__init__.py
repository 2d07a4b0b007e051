"""What differs between queue kinds, below every flow: the triage kind's fields (category,
priority, reply), how a model is asked for them, how its answer is read, and the text a triage
example carries. Generation, memory, review and the triage flow all read them from here."""
