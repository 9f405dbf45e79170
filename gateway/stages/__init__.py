"""Decision stages: pure functions from a call and a compiled policy to a Decision."""
