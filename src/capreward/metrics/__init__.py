"""Pure tensor math of the metrics: no model code is imported here."""
