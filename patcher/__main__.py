from patcher.cli import run

run()
