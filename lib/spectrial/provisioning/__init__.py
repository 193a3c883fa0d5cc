"""What a host needs before a trial: the llama.cpp build (`llamacpp`), engine venvs (`venvs`), uploads to remote hosts (`remote`)."""
