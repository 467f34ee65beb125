"""Translation: the Translator and what it runs on (ensembles, int8 and packed weights, alignments, the memory probe, giving freed memory back)."""
