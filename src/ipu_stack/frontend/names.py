"""Names the CLI needs without importing the importer: the workload name packages record."""

IMPORTED = "torch-export"
