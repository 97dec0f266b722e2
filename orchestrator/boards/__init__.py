"""Measuring on the target's own CPU: a board reached over SSH, or an emulated Arm CPU.

`urls` reads a target's `connect:`, `transports/` turns it into the command that starts
Python on the board (one module per way of reaching one), `session` speaks to the program
sent there (`board_runner`), `measurement` measures one model there and compares its
outputs with this host's, `emulated_board` builds the emulated board from Debian's arm64
packages and PyPI's aarch64 wheels, and `prepare` installs the runtimes on a board.
"""
