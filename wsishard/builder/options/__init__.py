"""Options: each build option declared once (type, default, unit, help, group), its keywords, its config file."""
