"""The draft-length model (drafting.length auto): acceptance and round costs, Eq. 1' online, the confidence stop, a draft that cannot pay."""
