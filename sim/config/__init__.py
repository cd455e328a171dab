"""Configuration: validated scenario files and the model, hardware and runtime catalogs."""
