"""Built-in chat templates, one JSON file per --prompt-type; a package so that the files ship in the wheel."""
