"""Results: significance tests (and, as the house is sorted, reports and figures)."""
