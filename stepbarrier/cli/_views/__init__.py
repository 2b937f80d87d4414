"""How the commands' results look in a terminal."""
