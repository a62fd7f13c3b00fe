"""A mixture: a composite of sources read as one dataset, with weights and schedules."""
