"""PostgreSQL: the batch view (cells by generation), the served row, the id table, the run log."""
