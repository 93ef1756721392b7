"""Beyond a gang restart: elastic resizes, stalls, and what each recovery cost (goodput)."""
