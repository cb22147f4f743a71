"""llama.cpp's ``src/`` layer (``llama-*.cpp``) rebuilt: sampling, chat templates, ..."""
