"""A server's life: start, readiness, stop by its recorded process group (`lifecycle`), and the check that its processes hold the environment asked for (`envcheck`)."""
