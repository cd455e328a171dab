"""The moe-trace v1 file format: schema, column types, row validation, reader and writer."""
