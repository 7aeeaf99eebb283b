"""Drawing and reporting: markdown, pictures, plots, and the versions a report names."""
