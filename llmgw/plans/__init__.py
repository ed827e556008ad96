"""Pure plans: wanted state and facts in, the steps to take (or the reason not to) out."""
